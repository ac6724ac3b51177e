"""Generated protobuf and gRPC stubs for the calor.v1 API (`make proto`)."""
