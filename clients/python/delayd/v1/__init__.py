# The delayd.v1 messages and service stubs, generated from proto/ by protoc
# and grpc_python_plugin (make generate-clients); do not edit the *_pb2*
# files by hand.
