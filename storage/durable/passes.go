package durable

import (
	"context"
	"errors"
	"fmt"

	"github.com/delayd/delayd/storage"
)

// incrementalPass repairs every task changed in MySQL at or after sinceMS
// whose index version differs.
func (s *reconciler) incrementalPass(ctx context.Context, sinceMS int64) (scanned, repaired int, err error) {
	cursor := sinceMS
	for {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
		rows, err := s.db.ReadChanged(cctx, cursor, s.batch)
		cancel()
		if err != nil {
			return scanned, repaired, err
		}
		full := len(rows) == s.batch
		if full && rows[0].UpdateMS == rows[len(rows)-1].UpdateMS {
			// more changes in one millisecond than a page: read it whole
			cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
			rows, err = s.db.ReadChangedAt(cctx, rows[0].UpdateMS)
			cancel()
			if err != nil {
				return scanned, repaired, err
			}
			cursor = rows[0].UpdateMS + 1
		} else if full {
			cursor = rows[len(rows)-1].UpdateMS // that millisecond is read again
		}
		scanned += len(rows)
		byNS := map[string][]storage.Version{}
		var order []string
		for _, r := range rows {
			if _, ok := byNS[r.NS]; !ok {
				order = append(order, r.NS)
			}
			byNS[r.NS] = append(byNS[r.NS], r.Version)
		}
		for _, ns := range order {
			n, err := s.checkVersions(ctx, ns, byNS[ns])
			repaired += n
			if err != nil {
				return scanned, repaired, err
			}
			if err := s.lease.keep(ctx); err != nil {
				return scanned, repaired, err
			}
		}
		if !full {
			return scanned, repaired, nil
		}
	}
}

// settleAcked settles the ack markers of nss (the namespaces MySQL holds
// rows of: an ack whose delete did not reach MySQL left its row there):
// each marked version MySQL still has is deleted, and every marker whose
// version MySQL no longer has is dropped (see repairIDs).
func (s *reconciler) settleAcked(ctx context.Context, nss []string) (int, error) {
	settled := 0
	for _, ns := range nss {
		var cursor uint64
		for {
			cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
			marks, next, err := s.idx.ScanAcked(cctx, ns, cursor, s.batch)
			if err == nil && len(marks) > 0 {
				ids := make([]string, len(marks))
				for i, m := range marks {
					ids[i] = m.ID
				}
				var n int
				n, err = s.repair.repairIDs(cctx, ns, ids)
				settled += n
			}
			cancel()
			if err != nil {
				return settled, err
			}
			if err := s.lease.keep(ctx); err != nil {
				return settled, err
			}
			if next == 0 {
				break
			}
			cursor = next
		}
	}
	return settled, nil
}

// fullPass compares every task of MySQL with the index (forward), every
// task of the index with MySQL (reverse), and settles every ack marker.
func (s *reconciler) fullPass(ctx context.Context, nss []string) (scanned, repaired int, err error) {
	for _, ns := range nss {
		after := ""
		for {
			cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
			vs, err := s.db.ReadVersions(cctx, ns, after, s.batch)
			cancel()
			if err != nil {
				return scanned, repaired, err
			}
			scanned += len(vs)
			n, err := s.checkVersions(ctx, ns, vs)
			repaired += n
			if err != nil {
				return scanned, repaired, err
			}
			if err := s.lease.keep(ctx); err != nil {
				return scanned, repaired, err
			}
			if len(vs) < s.batch {
				break
			}
			after = vs[len(vs)-1].ID
		}
	}
	idxNS, err := s.ownedIndexNamespaces(ctx)
	if err != nil {
		return scanned, repaired, err
	}
	for _, ns := range idxNS {
		n, err := s.reversePass(ctx, ns)
		repaired += n
		if err != nil {
			return scanned, repaired, err
		}
	}
	return scanned, repaired, nil
}

// reversePass walks the index's entries of ns (headers only) and forgets
// those whose task MySQL does not have, repairs those MySQL holds at
// another version, and settles the ack markers of ns.
func (s *reconciler) reversePass(ctx context.Context, ns string) (repaired int, err error) {
	var cursor uint64
	for {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
		page, next, err := s.idx.ScanVersions(cctx, ns, cursor, s.batch)
		if err == nil && len(page) > 0 {
			var n int
			n, err = s.repair.forgetOrphans(cctx, ns, page)
			repaired += n
		}
		cancel()
		if err != nil {
			return repaired, err
		}
		if err := s.lease.keep(ctx); err != nil {
			return repaired, err
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	n, err := s.settleAcked(ctx, []string{ns})
	return repaired + n, err
}

// checkVersions compares MySQL versions of tasks of ns with the index and
// repairs (repairIDs) those that differ or carry an ack marker.
func (s *reconciler) checkVersions(ctx context.Context, ns string, vs []storage.Version) (int, error) {
	if len(vs) == 0 {
		return 0, nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	have, marks, err := s.idx.Versions(cctx, ns, ids)
	if err != nil {
		return 0, fmt.Errorf("index versions: %w", err)
	}
	if len(have) != len(ids) || len(marks) != len(ids) {
		return 0, fmt.Errorf("index answered %d versions for %d ids", len(have), len(ids))
	}
	var need []string
	for i, v := range vs {
		if have[i] != v || marks[i].Delivery != 0 {
			need = append(need, v.ID)
		}
	}
	if len(need) == 0 {
		return 0, nil
	}
	return s.repair.repairIDs(cctx, ns, need)
}

// ownedIndexNamespaces is the index's namespaces that this deployment's
// MySQL knows: it holds tasks of them or has them in its registry. The
// reverse pass forgets index entries MySQL lacks, so it must never walk a
// namespace another deployment (a Redis-only delayd, or a durable one with
// another MySQL) keeps in the same Redis: those entries are not orphans.
func (s *reconciler) ownedIndexNamespaces(ctx context.Context) ([]string, error) {
	idxNS, err := s.idx.Namespaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("index namespaces: %w", err)
	}
	withTasks, err := s.taskNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	owned := make(map[string]bool, len(withTasks))
	for _, ns := range withTasks {
		owned[ns] = true
	}
	out := idxNS[:0]
	for _, ns := range idxNS {
		if !owned[ns] {
			cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
			_, err := s.db.GetNamespace(cctx, ns)
			cancel()
			switch {
			case errors.Is(err, storage.ErrNotFound):
				continue
			case err != nil:
				return nil, err
			}
		}
		out = append(out, ns)
	}
	return out, nil
}
