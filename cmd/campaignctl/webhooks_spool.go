package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// defaultSpoolDir is --spool-dir's default: under $XDG_STATE_HOME, else ~/.local/state; "" (no spool)
// when neither is set.
func (a *app) defaultSpoolDir() string {
	switch {
	case a.getenv("XDG_STATE_HOME") != "":
		return filepath.Join(a.getenv("XDG_STATE_HOME"), "campaignctl", "refusals")
	case a.getenv("HOME") != "":
		return filepath.Join(a.getenv("HOME"), ".local", "state", "campaignctl", "refusals")
	}
	return ""
}

// refusalSpoolDir is the directory of the spool under dir (--spool-dir): a subdirectory named after the
// engine database, so that processes of different databases on one machine never record each other's
// refusals. "" (no spool) when dir is "".
func (a *app) refusalSpoolDir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	db, err := databaseKey(a.dbURL())
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, db), nil
}

// databaseKey names a database by where it is, whatever else its URL holds (its password above all): the
// database's name and a hash of its host, port, name and user.
func databaseKey(url string) (string, error) {
	pc, err := poolConfig(url, "DATABASE_URL", 0)
	if err != nil {
		return "", err
	}
	cfg := pc.ConnConfig
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%s\x00%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)))
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, cfg.Database)
	return fmt.Sprintf("%.40s-%s", name, hex.EncodeToString(sum[:6])), nil
}

// refusedForGood marks an error campaign.RefusedForGood says every attempt would meet (Postgres refused
// what the write holds) as receipts.Final: the request is not held for it, nor spooled.
func refusedForGood(err error) error {
	if campaign.RefusedForGood(err) {
		return receipts.Final(err)
	}
	return err
}
