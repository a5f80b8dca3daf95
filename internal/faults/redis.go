package faults

import (
	"context"
	"net"

	"github.com/redis/go-redis/v9"
)

// Redis is a go-redis hook that applies its rules to every command (alone or in a pipeline) of the
// client it is added to: client.AddHook(f).
type Redis struct{ rules }

var _ redis.Hook = (*Redis)(nil)

// DialHook leaves connections alone.
func (f *Redis) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook applies the first rule that acts on the command.
func (f *Redis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r := f.pick(Call{Name: cmd.Name(), Args: cmd.Args()})
		err := around(ctx, r, func() error { return next(ctx, cmd) })
		if err != nil && r != nil {
			cmd.SetErr(err)
		}
		return err
	}
}

// ProcessPipelineHook applies to the whole pipeline the first rule that acts on any of its commands (a
// pipeline travels as one write and one read).
func (f *Redis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var r *Rule
		for _, cmd := range cmds {
			if r = f.pick(Call{Name: cmd.Name(), Args: cmd.Args()}); r != nil {
				break
			}
		}
		err := around(ctx, r, func() error { return next(ctx, cmds) })
		if err != nil && r != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
		}
		return err
	}
}
