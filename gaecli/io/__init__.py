"""Reading and writing rollout Parquet files: the column format, streaming reads, atomic writes."""
