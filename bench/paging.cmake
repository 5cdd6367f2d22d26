# Paging table (issue 7): coop and dtr-eq, offload off and auto (+ variants), arena mode, every DTR trace, 0.9..0.1.
#   build/bench/paging_table [traces dir, default ../shared/traces/dtr]  > table.md
remat_executable(paging_table SOURCES ${CMAKE_CURRENT_LIST_DIR}/paging_table.cc DEPS remat_runtime absl::strings
                 absl::str_format)
