//! One level's historical embeddings (FreshGNN §4.1): node id to an
//! embedding row and the step it was computed at, in a fixed number of
//! slots. An entry older than the staleness bound is gone; when every slot
//! is taken the oldest entry makes room, so the memory is what was stated.

use std::collections::{HashMap, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    slot: u32,
    step: u64,
}

/// A level's cache: `capacity` rows of `dim` floats.
pub struct LevelCache {
    dim: usize,
    rows: Vec<f32>,
    capacity: usize,
    entries: HashMap<u32, Entry>,
    /// Every admission in step order, `(node, slot, step)`; a record whose
    /// entry has since been replaced or evicted is skipped when it comes up.
    admitted: VecDeque<(u32, Entry)>,
    free: Vec<u32>,
}

impl LevelCache {
    pub fn new(capacity: usize, dim: usize) -> Self {
        LevelCache {
            dim,
            rows: Vec::new(),
            capacity,
            entries: HashMap::new(),
            admitted: VecDeque::new(),
            free: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The row of `node` if it is cached.
    pub fn get(&self, node: u32) -> Option<&[f32]> {
        let e = self.entries.get(&node)?;
        let at = e.slot as usize * self.dim;
        Some(&self.rows[at..at + self.dim])
    }

    /// Drops the entries computed before step `oldest`.
    pub fn expire(&mut self, oldest: u64) {
        while let Some(&(node, e)) = self.admitted.front() {
            if e.step >= oldest {
                break;
            }
            self.admitted.pop_front();
            self.drop_record(node, e);
        }
    }

    /// Caches `row` as `node`'s embedding at `step`, replacing an older one;
    /// with every slot taken, the oldest entry makes room.
    pub fn admit(&mut self, node: u32, row: &[f32], step: u64) {
        debug_assert_eq!(row.len(), self.dim);
        if self.capacity == 0 {
            return;
        }
        if let Some(old) = self.entries.remove(&node) {
            self.free.push(old.slot);
        }
        let allocated = self.rows.len() / self.dim.max(1);
        let slot = match self.free.pop() {
            Some(s) => s,
            None if allocated < self.capacity => {
                self.rows.resize(self.rows.len() + self.dim, 0.0);
                allocated as u32
            }
            None => self.evict_oldest(),
        };
        let at = slot as usize * self.dim;
        self.rows[at..at + self.dim].copy_from_slice(row);
        let e = Entry { slot, step };
        self.entries.insert(node, e);
        self.admitted.push_back((node, e));
        // Records of replaced entries wait for their turn at the front;
        // past a few times the live entries they are swept in one pass.
        if self.admitted.len() > 4 * self.capacity.max(16) {
            let entries = &self.entries;
            self.admitted.retain(|(n, e)| entries.get(n) == Some(e));
        }
    }

    /// Drops `node`'s entry, if any.
    pub fn evict(&mut self, node: u32) {
        if let Some(e) = self.entries.remove(&node) {
            self.free.push(e.slot);
        }
    }

    /// Frees the slot of the oldest live entry and returns it.
    fn evict_oldest(&mut self) -> u32 {
        while let Some((node, e)) = self.admitted.pop_front() {
            if self.entries.get(&node) == Some(&e) {
                self.entries.remove(&node);
                return e.slot;
            }
        }
        unreachable!("a full cache has a live entry")
    }

    fn drop_record(&mut self, node: u32, e: Entry) {
        if self.entries.get(&node) == Some(&e) {
            self.entries.remove(&node);
            self.free.push(e.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_by_step_and_the_oldest_makes_room() {
        let mut c = LevelCache::new(2, 3);
        c.admit(7, &[1.0, 2.0, 3.0], 0);
        c.admit(8, &[4.0; 3], 1);
        assert_eq!(c.get(7), Some(&[1.0, 2.0, 3.0][..]));
        // Full: node 9 takes the slot of the oldest, node 7.
        c.admit(9, &[5.0; 3], 2);
        assert_eq!(c.get(7), None);
        assert_eq!(c.get(8), Some(&[4.0; 3][..]));
        assert_eq!(c.len(), 2);
        // Re-admitting 8 at step 3 renews it: expiring before step 2 drops
        // nothing live (8's old record is skipped), before 3 drops 9.
        c.admit(8, &[6.0; 3], 3);
        c.expire(2);
        assert_eq!(c.len(), 2);
        c.expire(3);
        assert_eq!(c.get(9), None);
        assert_eq!(c.get(8), Some(&[6.0; 3][..]));
        c.evict(8);
        assert_eq!(c.len(), 0);
        // Freed slots are reused: no more rows than the capacity.
        for n in 0..10 {
            c.admit(n, &[n as f32; 3], 10 + u64::from(n));
        }
        assert_eq!(c.len(), 2);
        assert!(c.rows.len() <= 2 * 3);
        assert_eq!(c.get(9), Some(&[9.0; 3][..]));
    }

    #[test]
    fn a_cache_of_no_slots_holds_nothing() {
        let mut c = LevelCache::new(0, 4);
        c.admit(1, &[0.0; 4], 0);
        assert_eq!(c.get(1), None);
    }
}
