"""Prometheus metrics (`serve --metrics-listen`): what this process did, counted
as it happens, and the queue as the database holds it, read when scraped."""
