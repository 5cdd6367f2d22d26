# The trace reader (trace.cc) tokenizes its JSON lines with simdjson (Debian libsimdjson-dev, scripts/setup.sh).
find_package(simdjson REQUIRED)
target_link_libraries(remat_runtime PRIVATE simdjson::simdjson)
