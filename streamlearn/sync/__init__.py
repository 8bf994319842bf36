"""Model synchronisation across the replicas of a consumer group (issue 12)."""
