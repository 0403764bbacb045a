"""Handler modules. A module passed to `leasehold serve --handlers` defines
`register(registry: HandlerRegistry) -> None`."""
