"""Storage: the lake (Parquet trajectories, step manifests, checkpoints) on a local folder or
S3/MinIO, DuckDB queries over it, and MLflow tracking. No Prefect here."""
