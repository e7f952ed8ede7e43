package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/internal/netpolicy"
)

// answersVersion is the format of answers.json.
const answersVersion = 1

// answersFile is what Close keeps of the sandboxes' DNS answers, so that
// the next process of the agent lets their open connections (and new
// ones, until the answers expire) through as this one did.
type answersFile struct {
	Version   int                           `json:"version"`
	Sandboxes map[string][]netpolicy.Answer `json:"sandboxes"`
}

const answersName = "answers.json"

func (m *Manager) saveAnswers() error {
	if m.cfg.StateDir == "" {
		return nil
	}
	f := answersFile{Version: answersVersion, Sandboxes: map[string][]netpolicy.Answer{}}
	m.mu.Lock()
	for id, a := range m.boxes {
		if as := a.sb.Answers(); len(as) > 0 {
			f.Sandboxes[id] = as
		}
	}
	m.mu.Unlock()
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("network state: %w", err)
	}
	path := filepath.Join(m.cfg.StateDir, answersName)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("network state: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// loadAnswers reads what an earlier process saved; a missing, unreadable
// or unknown-version file is nothing (the sandboxes resolve again).
func loadAnswers(dir string, log *slog.Logger) map[string][]netpolicy.Answer {
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, answersName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var f answersFile
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err == nil && f.Version != answersVersion {
		err = fmt.Errorf("version %d, want %d", f.Version, answersVersion)
	}
	if err != nil {
		log.Warn("network: ignoring saved DNS answers", "err", err)
		return nil
	}
	return f.Sandboxes
}

// restoreAnswers learns again what sb's names resolved to before the
// agent restarted, as far as its policy still allows.
func (m *Manager) restoreAnswers(sb *netpolicy.Sandbox) {
	m.mu.Lock()
	as := m.saved[sb.ID]
	delete(m.saved, sb.ID)
	m.mu.Unlock()
	for _, a := range as {
		if ttl := time.Until(a.Expires); ttl > 0 {
			sb.Learn(a.Name, a.Addr, ttl)
		}
	}
}
