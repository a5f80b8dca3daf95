package main

import "github.com/spf13/cobra"

func (a *app) newWorkersCmd() *cobra.Command {
	return &cobra.Command{Use: "workers", Short: "Supervise worker processes, scaled by the backlog", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return usagef("workers is not available yet") }}
}
