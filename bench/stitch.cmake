# Stitching arena on the CPU: allocate + touch + free with the memfd provider against the contiguous arena
# (see stitch_bench.cc).
remat_executable(stitch_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/stitch_bench.cc
                 DEPS remat_allocator benchmark::benchmark)
