"""Long-running measurements of a real `leasehold serve` process (run as commands, not tests)."""
