// Command campaignctl plans, sends and operates bulk promo-code campaigns.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}
