package ctl

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/delayd/delayd/client"
)

func scopeList(ss []client.Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.String()
	}
	return strings.Join(names, ",")
}

func keyCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "API keys: create, list, revoke"}

	var scopes []string
	var description string
	create := &cobra.Command{
		Use:   "create NS --scope produce[,consume,admin]",
		Short: `Create an API key for a namespace ("*" for a global key); the secret is shown once`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ss []client.Scope
			for _, s := range scopes {
				sc, err := client.ParseScope(strings.TrimSpace(s))
				if err != nil {
					return usagef("--scope: %v", err)
				}
				ss = append(ss, sc)
			}
			if len(ss) == 0 {
				return usagef("--scope is required: produce, consume and/or admin")
			}
			a, err := g.admin()
			if err != nil {
				return err
			}
			k, secret, err := a.CreateKey(cmd.Context(), args[0], ss, description)
			if err != nil {
				return err
			}
			out := struct {
				client.Key
				Secret string `json:"secret"`
			}{k, secret}
			return g.emit(out, func() error {
				return g.fields([][2]string{
					{"id", k.ID}, {"namespace", k.Namespace}, {"scopes", scopeList(k.Scopes)},
					{"description", orDash(k.Description)}, {"secret", secret + "   (shown once: store it now)"},
				})
			})
		},
	}
	create.Flags().StringSliceVar(&scopes, "scope", nil, "scopes: produce, consume, admin (comma-separated or repeated)")
	create.Flags().StringVar(&description, "description", "", "free text for operators (at most 256 characters)")

	list := &cobra.Command{
		Use: "list NS", Short: `List a namespace's keys ("*" for global keys), never their secrets`, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			keys, err := a.Keys(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(keys, func() error {
				rows := make([][]string, len(keys))
				for i, k := range keys {
					rows[i] = []string{k.ID, k.Namespace, scopeList(k.Scopes), ts(k.CreateTime), orDash(short(k.Description, 40))}
				}
				return g.table([]string{"ID", "NAMESPACE", "SCOPES", "CREATED", "DESCRIPTION"}, rows)
			})
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "Revoke a key at once", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := g.admin()
			if err != nil {
				return err
			}
			if err := a.RevokeKey(cmd.Context(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]any{"revoked": args[0]}, func() error {
				return write(g.stdout, "revoked key %s\n", args[0])
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}
