package sandbox

// sendgridState is the SendGrid fake's state (rate limiter, event signing key, ...).
type sendgridState struct{}

// sendgridRoutes registers the SendGrid v3 Mail Send fake.
func (s *Server) sendgridRoutes() { s.sendgrid = &sendgridState{} }
