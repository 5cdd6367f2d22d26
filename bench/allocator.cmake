# Allocator benchmarks: arena allocate+free pair vs glibc malloc/free, window search (see allocator_bench.cc).
remat_executable(allocator_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/allocator_bench.cc
                 DEPS remat_allocator benchmark::benchmark)
