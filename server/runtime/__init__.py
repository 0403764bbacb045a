"""The in-process worker runtime: claims jobs through the repository and runs
their handlers. Handler authors import `leasehold.worker`, not this package."""
