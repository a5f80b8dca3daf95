package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/campaignctl/campaignctl/campaign"
)

// emailPreview completes an e-mail dry run's report: the first message's subject, sender and text part
// (on stdout, after the report; not with --json, whose report carries sample_subject and sample_message),
// and with --preview-dir its HTML and text parts in DIR/preview.html and DIR/preview.txt, to open in a
// browser before the launch.
func (a *app) emailPreview(rep campaign.Report, o launchOptions) error {
	if rep.Channel != campaign.ChannelEmail {
		if o.previewDir != "" {
			return usagef("--preview-dir shows an e-mail; a %s campaign has no HTML to preview", rep.Channel)
		}
		return nil
	}
	if !o.json {
		from := a.getenv("SENDGRID_FROM")
		if name := a.getenv("SENDGRID_FROM_NAME"); name != "" && from != "" {
			from = fmt.Sprintf("%s <%s>", name, from)
		}
		if from == "" {
			from = "(SENDGRID_FROM is not set)"
		}
		fmt.Fprintf(a.stdout, "First e-mail:\n  from:    %s\n  subject: %s\n  text part:\n%s\n", from, rep.SampleSubject, indent(rep.SampleMessage))
	}
	if o.previewDir == "" {
		return nil
	}
	if err := os.MkdirAll(o.previewDir, 0o700); err != nil {
		return usagef("--preview-dir: %v", err)
	}
	for name, body := range map[string]string{"preview.html": rep.SampleHTML, "preview.txt": rep.SampleMessage} {
		if name == "preview.html" && body == "" {
			continue // no --html part
		}
		if err := os.WriteFile(filepath.Join(o.previewDir, name), []byte(body), 0o600); err != nil {
			return fmt.Errorf("write the preview: %w", err)
		}
	}
	if !o.json {
		fmt.Fprintf(a.stdout, "  preview written to %s\n", o.previewDir)
	}
	return nil
}

// indent prefixes every line of s with four spaces.
func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }
