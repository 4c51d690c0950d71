package balancer

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A deadline some candidates' estimates meet drops the others (Explain
// says why); one that none meets goes to the candidate that misses by
// least, or refuses a sheddable request at once; a policy that estimates
// no TTFT is left alone.
func TestDeadlineKeepsTheCandidatesThatMeetIt(t *testing.T) {
	b := newBal(t, "ttft")
	// fast has nothing queued; slow has ten 2,000-token prompts ahead.
	b.Update(busy("fast", 0, 0, 0.1), busy("slow", 10, 4, 0.1))
	req := func(deadline time.Duration, prio int) *Request {
		r := distinct(1, 2000)
		r.TTFTDeadline, r.Priority = deadline, prio
		return r
	}
	est := map[string]float64{}
	for _, be := range b.Explain(req(0, 0)).Backends {
		est[be.ID] = be.FirstToken()
	}
	if !(est["fast"] > 0 && est["slow"] > est["fast"]) {
		t.Fatalf("estimates %v: want slow above fast", est)
	}
	between := time.Duration((est["fast"] + est["slow"]) / 2 * float64(time.Second))

	ex := b.Explain(req(between, 0))
	if ex.Chosen[0] != "fast" || len(ex.Chosen) != 1 {
		t.Errorf("deadline between the estimates: chosen %v, want fast alone", ex.Chosen)
	}
	var why string
	for _, be := range ex.Backends {
		if be.ID == "slow" {
			why = be.Excluded
		}
	}
	if !strings.Contains(why, "deadline") {
		t.Errorf("slow is not excluded for the deadline: %q", why)
	}

	// None meets 1µs: the one that misses by least, or no one.
	d, err := b.Pick(req(time.Microsecond, 0), nil)
	if err != nil || d.Candidates[0].ID != "fast" || d.Reason != ReasonDeadline {
		t.Errorf("priority 0, deadline none meets: %v %v (%s), want fast (deadline)", d.Candidates, err, d.Reason)
	}
	if _, err := b.Pick(req(time.Microsecond, -1), nil); !errors.Is(err, ErrDeadline) {
		t.Errorf("sheddable, deadline none meets: %v, want ErrDeadline", err)
	}
	// Time spent before the pick counts: a deadline that has passed.
	late := req(time.Hour, -1)
	late.Arrived = time.Now().Add(-2 * time.Hour)
	if _, err := b.Pick(late, nil); !errors.Is(err, ErrDeadline) {
		t.Errorf("sheddable, arrived past its deadline: %v, want ErrDeadline", err)
	}

	// Round-robin writes no estimate: the deadline changes nothing.
	rr := newBal(t, "round-robin")
	rr.Update(busy("fast", 0, 0, 0.1), busy("slow", 10, 4, 0.1))
	if _, err := rr.Pick(req(time.Microsecond, -1), nil); err != nil {
		t.Errorf("round-robin with a deadline: %v", err)
	}
}

// Within a tenant's queue the earliest deadline goes first; requests
// without one keep their order behind those with one; another priority
// still goes by priority.
func TestAdmissionEarliestDeadlineFirst(t *testing.T) {
	a := testAdmission(t, FairRoundRobin, 10)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	labels := map[*waiter]string{}
	for _, w := range []struct {
		label    string
		deadline time.Duration
		prio     int
	}{{"none-1", 0, 0}, {"300ms", 300 * time.Millisecond, 0}, {"100ms", 100 * time.Millisecond, 0}, {"none-2", 0, 0}, {"200ms", 200 * time.Millisecond, 0}, {"urgent-none", 0, 1}} {
		wt, err := a.enter(&Request{TTFTDeadline: w.deadline, Priority: w.prio, Arrived: now}, now)
		if err != nil {
			t.Fatal(err)
		}
		labels[wt] = w.label
	}
	var got []string
	for a.head != nil {
		h := a.head
		got = append(got, labels[h])
		a.leave(h, true)
	}
	want := "urgent-none 100ms 200ms 300ms none-1 none-2"
	if strings.Join(got, " ") != want {
		t.Errorf("served %v, want %s", got, want)
	}
}
