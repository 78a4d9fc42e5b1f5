//! A sparse segment tree over slots that answers "the leftmost slot whose value is at least `need`".
//!
//! First fit asks exactly that question. A dense segment tree would cost O(slots) memory per index, and
//! the `fewer-jobs-node` layer keeps one index per host-load group, most of them nearly empty. Nodes
//! here exist only above slots that hold a value, and a slot set back to zero frees its path, so memory
//! follows the entries while every operation stays O(log slots). A slot past the end grows the tree by
//! adding roots, so a pool that appends GPUs keeps its index.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    max: u64,
    child: [u32; 2],
}

#[derive(Debug, Clone)]
pub(crate) struct SparseMaxTree {
    depth: u32,
    root: u32,
    nodes: Vec<Node>,
    free: Vec<u32>,
}

impl SparseMaxTree {
    /// A tree for slots `0..slots`, all zero.
    pub(crate) fn new(slots: u32) -> Self {
        let depth = slots.max(1).next_power_of_two().trailing_zeros();
        SparseMaxTree { depth, root: NIL, nodes: Vec::new(), free: Vec::new() }
    }

    fn alloc(&mut self) -> u32 {
        let node = Node { max: 0, child: [NIL, NIL] };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 nodes")
            }
        }
    }

    /// Sets `slot` to `value`; zero means absent.
    pub(crate) fn set(&mut self, slot: u32, value: u64) {
        while u64::from(slot) >= 1u64 << self.depth {
            if value == 0 {
                return;
            }
            if self.root != NIL {
                let root = self.alloc();
                self.nodes[root as usize] =
                    Node { max: self.nodes[self.root as usize].max, child: [self.root, NIL] };
                self.root = root;
            }
            self.depth += 1;
        }
        if self.root == NIL {
            if value == 0 {
                return;
            }
            self.root = self.alloc();
        }
        let mut path = [NIL; 33];
        let mut node = self.root;
        for level in (0..self.depth).rev() {
            path[level as usize] = node;
            let bit = ((slot >> level) & 1) as usize;
            let mut next = self.nodes[node as usize].child[bit];
            if next == NIL {
                if value == 0 {
                    return;
                }
                next = self.alloc();
                self.nodes[node as usize].child[bit] = next;
            }
            node = next;
        }
        self.nodes[node as usize].max = value;
        for level in 0..self.depth {
            let parent = path[level as usize];
            let bit = ((slot >> level) & 1) as usize;
            if self.nodes[node as usize].max == 0 {
                self.free.push(node);
                self.nodes[parent as usize].child[bit] = NIL;
            }
            let [l, r] = self.nodes[parent as usize].child;
            self.nodes[parent as usize].max = self.max_of(l).max(self.max_of(r));
            node = parent;
        }
        if self.nodes[self.root as usize].max == 0 {
            self.free.push(self.root);
            self.root = NIL;
        }
    }

    fn max_of(&self, node: u32) -> u64 {
        if node == NIL {
            0
        } else {
            self.nodes[node as usize].max
        }
    }

    /// The leftmost slot with a value of at least `need` (`need` >= 1).
    pub(crate) fn leftmost_at_least(&self, need: u64) -> Option<u32> {
        let need = need.max(1);
        if self.max_of(self.root) < need {
            return None;
        }
        let mut node = self.root;
        let mut slot = 0u32;
        for level in (0..self.depth).rev() {
            let [l, r] = self.nodes[node as usize].child;
            if self.max_of(l) >= need {
                node = l;
            } else {
                node = r;
                slot |= 1 << level;
            }
        }
        Some(slot)
    }

    #[cfg(test)]
    fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_leftmost_and_frees_cleared_paths() {
        let mut tree = SparseMaxTree::new(1000);
        assert_eq!(tree.leftmost_at_least(1), None);
        tree.set(700, 5);
        tree.set(3, 2);
        tree.set(512, 9);
        assert_eq!(tree.leftmost_at_least(1), Some(3));
        assert_eq!(tree.leftmost_at_least(3), Some(512));
        assert_eq!(tree.leftmost_at_least(9), Some(512));
        assert_eq!(tree.leftmost_at_least(10), None);
        tree.set(512, 0);
        assert_eq!(tree.leftmost_at_least(3), Some(700));
        for slot in [3, 700] {
            tree.set(slot, 0);
        }
        assert_eq!(tree.live_nodes(), 0);
        tree.set(999, 0);
        assert_eq!(tree.live_nodes(), 0);
    }

    #[test]
    fn grows_for_slots_past_the_end() {
        let mut tree = SparseMaxTree::new(2);
        tree.set(1, 3);
        tree.set(5000, 7);
        tree.set(70_000, 0);
        assert_eq!(tree.leftmost_at_least(3), Some(1));
        assert_eq!(tree.leftmost_at_least(4), Some(5000));
        tree.set(1, 0);
        tree.set(5000, 0);
        assert_eq!(tree.live_nodes(), 0);
        assert_eq!(tree.leftmost_at_least(1), None);
    }

    #[test]
    fn a_single_slot_tree_works() {
        let mut tree = SparseMaxTree::new(1);
        tree.set(0, 4);
        assert_eq!(tree.leftmost_at_least(4), Some(0));
        assert_eq!(tree.leftmost_at_least(5), None);
    }

    proptest! {
        #[test]
        fn agrees_with_a_linear_scan(ops in proptest::collection::vec((0u32..64, 0u64..20, 1u64..22), 1..200)) {
            let mut tree = SparseMaxTree::new(64);
            let mut values = [0u64; 64];
            for (slot, value, need) in ops {
                tree.set(slot, value);
                values[slot as usize] = value;
                let expected = values.iter().position(|&v| v >= need).map(|p| p as u32);
                prop_assert_eq!(tree.leftmost_at_least(need), expected);
            }
        }
    }
}
