package server

import delaydv1 "github.com/delayd/delayd/gen/delayd/v1"

// namespaceService implements delaydv1.NamespaceServiceServer.
// Placeholder until the delivery and tenancy work land: every RPC answers
// Unimplemented.
type namespaceService struct {
	delaydv1.UnimplementedNamespaceServiceServer
}

func newNamespaceService(opts Options) *namespaceService { return &namespaceService{} }
