"""The SQL implementation of the job repository (SQLAlchemy Core)."""
