package sandbox

// receiptState holds what the receipt emitters need (Twilio status callbacks).
type receiptState struct{}

// receiptRoutes sets up the delivery receipt emitters.
func (s *Server) receiptRoutes() { s.receipts = &receiptState{} }
