"""The repository contract: one suite, run unchanged against every storage engine
(the `repository` fixture is parametrized over tests.support.ENGINES)."""
