package main

import (
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// exampleSettings configures each registered provider well enough for its constructor (nothing is sent),
// with a cap of its own so that the test sees which variable was read. A provider registered without an
// example here fails TestEveryChannelHasAProvider.
func exampleSettings(t *testing.T) map[string]map[string]string {
	creds := filepath.Join(t.TempDir(), "service-account.json")
	if err := sandbox.WriteServiceAccount(creds, "http://127.0.0.1:1", "demo-project"); err != nil {
		t.Fatal(err)
	}
	return map[string]map[string]string{
		"twilio":   {"TWILIO_ACCOUNT_SID": "ACx", "TWILIO_AUTH_TOKEN": "tok", "TWILIO_FROM": "+905550000000", "TWILIO_RATE": "11"},
		"netgsm":   {"NETGSM_USERCODE": "850", "NETGSM_PASSWORD": "pw", "NETGSM_HEADER": "KAMPANYA", "NETGSM_RATE": "12"},
		"sendgrid": {"SENDGRID_API_KEY": "SG.x", "SENDGRID_FROM": "shop@example.com", "SENDGRID_RATE": "13"},
		"fcm":      {"GOOGLE_APPLICATION_CREDENTIALS": creds, "FCM_PROJECT_ID": "demo-project", "FCM_RATE": "14"},
		"webhook":  {"WEBHOOK_URL": "https://hooks.example.com/in", "WEBHOOK_SECRET": "s", "WEBHOOK_RATE": "15"},
	}
}

// Every channel the engine registers is sent by a provider the CLI registers, and each provider is
// complete: its settings build it, its cap has a variable of its own that it reads, and the help of
// launch and worker and the message for a worker without providers name the channel and its settings.
func TestEveryChannelHasAProvider(t *testing.T) {
	t.Parallel()
	examples := exampleSettings(t)
	specs := providerSpecs()
	byChannel := map[campaign.Channel][]providerSpec{}
	names, rateEnvs := map[string]bool{}, map[string]bool{}
	for _, ps := range specs {
		if _, err := campaign.ParseChannel(string(ps.channel)); err != nil {
			t.Errorf("provider %s: %v", ps.name, err)
		}
		if ps.name == "" || names[ps.name] || len(ps.settings) == 0 || len(ps.required()) == 0 || ps.build == nil {
			t.Errorf("provider %q: a name of its own, settings, what a setup needs and a constructor are all required", ps.name)
		}
		if !strings.HasSuffix(ps.rateEnv, "_RATE") || rateEnvs[ps.rateEnv] || ps.defaultRate <= 0 {
			t.Errorf("provider %s: cap %q (default %v): each provider's cap has a *_RATE variable of its own and a safe default", ps.name, ps.rateEnv, ps.defaultRate)
		}
		names[ps.name], rateEnvs[ps.rateEnv] = true, true
		byChannel[ps.channel] = append(byChannel[ps.channel], ps)
	}

	a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	_, noneErr := a.providers(sendOpts{timeout: time.Second})
	if noneErr == nil {
		t.Fatal("a worker without settings found a provider")
	}
	launchHelp := a.newLaunchCmd().Flag("channel").Usage
	workerHelp := a.newWorkerCmd().Long

	for _, ch := range campaign.Channels() {
		regs := byChannel[ch.Name]
		if len(regs) == 0 {
			t.Errorf("channel %s: no provider registered in providerSpecs", ch.Name)
			continue
		}
		if !strings.Contains(launchHelp, string(ch.Name)) {
			t.Errorf("channel %s: launch --channel help %q does not list it", ch.Name, launchHelp)
		}
		if !strings.Contains(workerHelp, "\n  "+string(ch.Name)+" ") {
			t.Errorf("channel %s: worker help does not list it with its settings", ch.Name)
		}
		if !strings.Contains(noneErr.Error(), "("+string(ch.Name)+")") {
			t.Errorf("channel %s: the no-provider message does not name it: %v", ch.Name, noneErr)
		}
		for i, ps := range regs {
			env, ok := examples[ps.name]
			if !ok {
				t.Errorf("provider %s: no example settings in this test", ps.name)
				continue
			}
			for _, v := range append([]string{ps.rateEnv}, ps.required()...) {
				if !strings.Contains(workerHelp, v) {
					t.Errorf("provider %s: worker help does not name %s", ps.name, v)
				}
				if v != ps.rateEnv && !strings.Contains(noneErr.Error(), v) {
					t.Errorf("provider %s: the no-provider message does not name %s", ps.name, v)
				}
			}
			a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return env[k] }}
			set, err := a.providers(sendOpts{timeout: time.Second})
			if err != nil {
				t.Errorf("provider %s: %v", ps.name, err)
				continue
			}
			p := set.primary[ch.Name]
			if p == nil || p.Name() != ps.name || len(set.primary) != 1 {
				t.Errorf("provider %s alone configured: channel %s sent by %v (%d channels)", ps.name, ch.Name, p, len(set.primary))
				continue
			}
			want, _ := strconv.ParseFloat(env[ps.rateEnv], 64)
			if set.rates[ps.name] != want {
				t.Errorf("provider %s: cap %v, want %s=%v", ps.name, set.rates[ps.name], ps.rateEnv, want)
			}
			r, segments, err := a.channelRate(ch.Name)
			if err != nil || r != want {
				t.Errorf("provider %s alone: the channel's cap %v (%v), want %s=%v", ps.name, r, err, ps.rateEnv, want)
			}
			// The dry run's ETA counts segments where the worker's tokens do (the adapter says).
			if sp, ok := p.(providers.SegmentPaced); segments != (ok && sp.PacesSegments()) {
				t.Errorf("provider %s: its spec says the cap counts segments: %v; the adapter: %v", ps.name, segments, ok && sp.PacesSegments())
			}
			if i > 0 {
				// A later provider of the channel is the first one's fallback when both are configured.
				both := map[string]string{}
				for _, m := range []map[string]string{examples[regs[0].name], env} {
					for k, v := range m {
						both[k] = v
					}
				}
				a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return both[k] }}
				set, err := a.providers(sendOpts{timeout: time.Second})
				if err != nil || set.primary[ch.Name].Name() != regs[0].name || set.fallback[ch.Name] == nil || set.fallback[ch.Name].Name() != ps.name {
					t.Errorf("providers %s and %s: primary %v, fallback %v (%v)", regs[0].name, ps.name, set.primary[ch.Name], set.fallback[ch.Name], err)
				}
			}
		}
	}
}
