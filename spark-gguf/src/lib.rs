//! GGUF v3 for Spark.
