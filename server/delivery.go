package server

import delaydv1 "github.com/delayd/delayd/gen/delayd/v1"

// deliveryService implements delaydv1.DeliveryServiceServer.
// Placeholder until the delivery work lands: every RPC answers Unimplemented.
type deliveryService struct {
	delaydv1.UnimplementedDeliveryServiceServer
}

func newDeliveryService(opts Options) *deliveryService { return &deliveryService{} }
