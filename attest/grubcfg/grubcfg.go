// Package grubcfg predicts what GRUB measures when it runs a grub.cfg:
// the text of every command it runs (PCR 8, with the command line it
// hands the kernel) and every file it reads (PCR 9), in order — so a
// policy can accept a new initramfs, grub.cfg or command line before any
// machine boots them (`nodeproof policy learn --grub-cfg`).
//
// It runs the plain part of GRUB's script language: commands one per line,
// comments, variables (`set NAME=VALUE`, `NAME=VALUE`, `$NAME`, `${NAME}`)
// and quotes, `linux`/`linuxefi`/`linux16` (which read the kernel and
// measure its command line) and `initrd`/`initrdefi` (which read each
// initrd). Anything whose effect it cannot know from the file alone —
// control flow (`if`, `for`, `while`, `function`), menus (`menuentry`,
// `submenu`), reading other files (`source`, `configfile`, `load_env`),
// arguments that GRUB quotes again for the kernel (with spaces, quotes or
// backslashes) — is an error that names the line: learn such a
// configuration from a booted machine instead.
package grubcfg

import (
	"errors"
	"fmt"
	"strings"
)

// Measure is what GRUB measures running a grub.cfg.
type Measure struct {
	// Commands are the texts GRUB measures into PCR 8, in order: each
	// command as parsed (variables expanded, quotes gone), and after a
	// linux command the kernel's command line (its path and arguments).
	Commands []string
	// Files are the paths of the files GRUB reads, in order (PCR 9
	// measures their contents).
	Files []string
	// KernelCmdline is the command line GRUB hands the kernel (the
	// kernel's path and its arguments); "" when the file boots none.
	KernelCmdline string
	// KernelPath is the kernel's path (of Files); "" when none.
	KernelPath string
}

// Limits on what is read.
const (
	maxConfig = 1 << 20
	maxLines  = 10000
)

// unsupported are the words whose effect cannot be known from the file.
var unsupported = map[string]string{
	"if": "control flow", "then": "control flow", "else": "control flow", "elif": "control flow", "fi": "control flow",
	"for": "control flow", "while": "control flow", "until": "control flow", "do": "control flow", "done": "control flow",
	"function": "a function", "menuentry": "a menu", "submenu": "a menu",
	"source": "another file", "configfile": "another file", "load_env": "another file (grubenv)", ".": "another file",
	"blscfg": "BootLoaderSpec entries (other files)", "save_env": "writing grubenv",
}

// Run predicts what GRUB measures running cfg, with vars set beforehand
// (the values GRUB's built-in configuration leaves, if any).
func Run(cfg []byte, vars map[string]string) (*Measure, error) {
	if len(cfg) > maxConfig {
		return nil, fmt.Errorf("grub.cfg of %d bytes (at most %d)", len(cfg), maxConfig)
	}
	env := map[string]string{}
	for k, v := range vars {
		env[k] = v
	}
	m := &Measure{}
	lines := strings.Split(strings.ReplaceAll(string(cfg), "\r\n", "\n"), "\n")
	if len(lines) > maxLines {
		return nil, fmt.Errorf("grub.cfg of %d lines (at most %d)", len(lines), maxLines)
	}
	for n, line := range lines {
		words, err := split(line, env)
		if err != nil {
			return nil, fmt.Errorf("grub.cfg line %d: %w", n+1, err)
		}
		if len(words) == 0 {
			continue
		}
		if why, ok := unsupported[words[0]]; ok {
			return nil, fmt.Errorf("grub.cfg line %d: %q (%s) is beyond what can be predicted from the file: learn this configuration from a booted machine (policy learn --event-log)", n+1, words[0], why)
		}
		if strings.ContainsAny(words[0], "{}();|&") {
			return nil, fmt.Errorf("grub.cfg line %d: %q is not a plain command", n+1, words[0])
		}
		m.Commands = append(m.Commands, strings.Join(words, " "))
		switch cmd := words[0]; {
		case cmd == "set":
			for _, w := range words[1:] {
				k, v, _ := strings.Cut(w, "=")
				env[k] = v
			}
		case strings.Contains(cmd, "="):
			k, v, _ := strings.Cut(cmd, "=")
			env[k] = v
		case cmd == "linux" || cmd == "linuxefi" || cmd == "linux16":
			if len(words) < 2 {
				return nil, fmt.Errorf("grub.cfg line %d: %s without a kernel", n+1, cmd)
			}
			if m.KernelCmdline != "" {
				return nil, fmt.Errorf("grub.cfg line %d: a second linux command", n+1)
			}
			for _, a := range words[1:] {
				if strings.ContainsAny(a, " \t\"\\") {
					return nil, fmt.Errorf("grub.cfg line %d: argument %q holds a space, a quote or a backslash, which GRUB quotes again for the kernel: learn this command line from a booted machine", n+1, a)
				}
			}
			m.Files = append(m.Files, words[1])
			m.KernelPath = words[1]
			m.KernelCmdline = strings.Join(words[1:], " ")
			m.Commands = append(m.Commands, m.KernelCmdline)
		case cmd == "initrd" || cmd == "initrdefi" || cmd == "initrd16":
			if len(words) < 2 {
				return nil, fmt.Errorf("grub.cfg line %d: %s without a file", n+1, cmd)
			}
			for _, f := range words[1:] {
				if strings.ContainsAny(f, " \t") {
					return nil, fmt.Errorf("grub.cfg line %d: the file %q holds a space", n+1, f)
				}
			}
			m.Files = append(m.Files, words[1:]...)
		}
	}
	return m, nil
}

// split reads one line as GRUB's parser does: words separated by blanks,
// '#' starting a comment where a word could start, single quotes literal,
// double quotes expanding variables, a backslash escaping the next
// character; $NAME and ${NAME} expanded (unset: empty).
func split(line string, env map[string]string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			return words, nil
		case c == '\\':
			if i+1 >= len(line) {
				return nil, errors.New("a backslash at the end of a line (a continued line)")
			}
			i++
			cur.WriteByte(line[i])
			inWord = true
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("an unterminated single quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
			}
			if j >= len(line) {
				return nil, errors.New("an unterminated double quote")
			}
			s, err := expand(line[i+1:j], env, true)
			if err != nil {
				return nil, err
			}
			cur.WriteString(s)
			i = j
			inWord = true
		case c == '$':
			name, n, err := varName(line[i+1:])
			if err != nil {
				return nil, err
			}
			cur.WriteString(env[name])
			i += n
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, nil
}

// expand expands variables in the text of a double-quoted string.
func expand(s string, env map[string]string, quoted bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && quoted && i+1 < len(s) && strings.IndexByte(`$"\`, s[i+1]) >= 0:
			i++
			b.WriteByte(s[i])
		case c == '$':
			name, n, err := varName(s[i+1:])
			if err != nil {
				return "", err
			}
			b.WriteString(env[name])
			i += n
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// varName reads a variable name after '$': NAME or {NAME}; it returns the
// name and how many bytes it took.
func varName(s string) (string, int, error) {
	if strings.HasPrefix(s, "{") {
		j := strings.IndexByte(s, '}')
		if j < 0 {
			return "", 0, errors.New("an unterminated ${")
		}
		return s[1:j], j + 1, nil
	}
	j := 0
	for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9' || (j == 0 && strings.IndexByte("?#@*", s[j]) >= 0)) {
		j++
		if j == 1 && strings.IndexByte("?#@*", s[0]) >= 0 {
			break
		}
	}
	if j == 0 {
		return "", 0, errors.New("a $ without a variable name")
	}
	return s[:j], j, nil
}
