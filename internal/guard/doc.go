// Package guard holds the containment pieces every backend shares: the
// default seccomp profile, masked and read-only /proc and /sys paths, the
// reduced capability set, and caps on the output a sandbox can send back.
package guard
