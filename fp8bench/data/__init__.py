"""The data side: the DuckDB store (ingest of shards and exports, the wide views) and asv's result files."""
