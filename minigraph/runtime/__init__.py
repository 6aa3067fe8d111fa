"""The runtime: sessions, the scheduler, memory recycling and run statistics."""
