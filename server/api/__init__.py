"""The gRPC face of the service: owner resolution, validation, conversion, errors."""
