remat_test(dense_scan_test SOURCES dense_scan_test.cc DEPS remat_runtime)
