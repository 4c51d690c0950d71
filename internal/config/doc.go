// Package config is llmlb's strict loader of config.yaml: one Config
// gathering each package's own section, read with a private viper
// instance over the defaults, overridden by LLMLB_* environment variables,
// and decoded strictly, so that an unknown key, a misspelt variable or a
// value of the wrong type is an error naming it, every problem of a file
// reported at once.
package config
