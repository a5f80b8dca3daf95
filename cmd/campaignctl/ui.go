package main

import "github.com/spf13/cobra"

func (a *app) newUICmd() *cobra.Command {
	return &cobra.Command{Use: "ui", Short: "The Asynq web UI (asynqmon), embedded", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return usagef("ui is not available yet") }}
}
