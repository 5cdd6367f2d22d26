# PageInOrder (runtime/page_in_order.h, header-only): what the engine prefetches next on CUDA (issue 19).
remat_test(page_in_order_test SOURCES page_in_order_test.cc DEPS remat_runtime)
