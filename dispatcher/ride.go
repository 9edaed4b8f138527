package dispatcher

import "time"

// expectPop tells the store how soon the loop pops next (0: not soon), so
// the acks and nacks of the namespace ride that pop (Store.ExpectPop). A
// "not soon" already told is not told again. Called by the loop only.
func (n *namespace) expectPop(within time.Duration) {
	if within <= 0 && !n.riding {
		return
	}
	n.riding = within > 0
	n.d.cfg.Store.ExpectPop(n.name, within)
}
