"""Generated code for the leasehold.v1 protobuf package; do not edit, run scripts/generate-stubs."""
