"""Python client for delayd, the multi-tenant delay-task gRPC service.

delayd.v1 holds the generated messages and stubs (TaskService,
DeliveryService, NamespaceService); delayd.consumer is a consumer loop over
StreamDeliveries with acks, nacks, lease extension and reconnection.
"""

from delayd.consumer import Consumer, Message, Retry, bearer

__all__ = ["Consumer", "Message", "Retry", "bearer"]
