package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3". Without it the module
// version (go install ...@v1.2.3) or "devel" is shown, with the VCS revision when the build has one.
var version = ""

type versionInfo struct {
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: version}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if v.Version == "" {
			v.Version = "devel"
		}
		return v
	}
	v.Go = bi.GoVersion
	if v.Version == "" {
		v.Version = bi.Main.Version
	}
	if v.Version == "" || v.Version == "(devel)" {
		v.Version = "devel"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (a *app) newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version, the source revision and the Go version of this build",
		Example: "  campaignctl version\n  campaignctl version --json",
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := buildVersion()
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(v)
			}
			fmt.Fprintf(a.stdout, "campaignctl %s", v.Version)
			if v.Revision != "" {
				rev := v.Revision
				if len(rev) > 12 {
					rev = rev[:12]
				}
				fmt.Fprintf(a.stdout, " (%s", rev)
				if v.Modified {
					fmt.Fprint(a.stdout, ", modified")
				}
				fmt.Fprint(a.stdout, ")")
			}
			if v.Go != "" {
				fmt.Fprintf(a.stdout, " %s", v.Go)
			}
			fmt.Fprintln(a.stdout)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
