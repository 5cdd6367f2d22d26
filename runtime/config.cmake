# Byte sizes and the REMAT_* environment settings, shared by the CLI, the engine's options and the integration.
remat_library(remat_config
  SOURCES byte_size.cc config.cc
  DEPS absl::status absl::statusor absl::strings absl::str_format)
