package worker

import "github.com/campaignctl/campaignctl/internal/unsubscribe"

// testSigner signs the unsubscribe links of the tests' commercial e-mails.
var testSigner = func() *unsubscribe.Signer {
	s, err := unsubscribe.New("test-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		panic(err)
	}
	return s
}()
