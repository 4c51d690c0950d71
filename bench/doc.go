// Package bench measures llmlb. The routing benchmark behind `llmlb bench`
// replays workloads (the Mooncake traces and synthetic ones) through the
// real balancer, with each policy's preset as serve builds it, in front of
// emulated engines in virtual time, with any number of independent
// replicas; it sweeps arrival rates ([Sweep]) and replays published
// experiments beside their published figures ([Experiments]). [HTTPReplay]
// replays the same workloads over HTTP in real time. What a proxy adds per
// request, against HAProxy and nginx, is package overhead's.
package bench
