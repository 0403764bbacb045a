"""Generated code for the leasehold protobuf package; do not edit, run scripts/generate-stubs."""
