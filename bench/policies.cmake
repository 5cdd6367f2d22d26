# Policy benchmarks: choosing a victim among 10k candidates per policy, and a Coop window over 10k arena blocks.
#   build/bench/policies_bench --benchmark_filter=Choose
remat_executable(policies_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/policies_bench.cc
                 DEPS remat_runtime remat_policies remat_allocator benchmark::benchmark)
