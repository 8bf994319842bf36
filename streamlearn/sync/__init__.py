"""Model synchronisation across the replicas of a consumer group (docs/operations.md)."""
