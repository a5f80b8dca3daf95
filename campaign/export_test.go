package campaign

// RecordDeliveriesSQL is RecordDeliveries' statement, for tests that check its shape.
var RecordDeliveriesSQL = recordDeliveriesSQL
