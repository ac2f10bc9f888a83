//! A hit's claim, finished outside the state lock: the window bind of a remote handle,
//! the shadow copy of a shared entry.

use super::*;

impl<R: Registrar> Cache<R> {
    /// A hit's claim made under the lock, finished without it: a remote one's window
    /// bound (`Registrar::grant`), a shadow copy filled; None: the reference given back,
    /// the caller takes the miss path.
    pub(super) fn finish_claim(&self, claim: Claim, req: &Request) -> Option<usize> {
        match claim {
            Claim::Ready(h) => Some(h),
            Claim::NeedGrant { id, mr } => {
                let granted = self.registrar.grant(mr, req).map(|h| self.mine(h));
                let mut st = self.lock();
                match granted {
                    Ok(h) => {
                        st.released_grants.remove(&h);
                        st.handles.insert(
                            h,
                            Handle::Granted {
                                id,
                                access: req.access,
                            },
                        );
                        self.stats.add(Counter::RemoteGrants, 1);
                        Some(h)
                    }
                    Err(_) => {
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(&self.fast, id) {
                            drop(st);
                            self.deregister_all(&[mr]);
                        }
                        None
                    }
                }
            }
            Claim::NeedShadow { id, mr } => {
                let spare = {
                    let mut st = self.lock();
                    let s = st.spare_shadows.iter().next().copied();
                    if let Some(s) = s {
                        st.spare_shadows.remove(&s);
                        // Neither spare nor handed out while it is filled without the
                        // lock: a release or rereg of the app's old handle meanwhile is
                        // still a double release.
                        st.refilling.insert(s);
                    }
                    s
                };
                let slot = spare.or_else(|| self.registrar.alloc_shadow().map(|s| self.mine(s)));
                let filled = slot.filter(|&s| self.registrar.fill_shadow(s, mr, req.addr, req.len));
                let mut st = self.lock();
                if let Some(s) = spare {
                    st.refilling.remove(&s);
                }
                match filled {
                    Some(s) => {
                        st.handles.insert(
                            s,
                            Handle::Shadow {
                                id,
                                access: req.access,
                            },
                        );
                        Some(s)
                    }
                    None => {
                        if let Some(s) = slot {
                            st.spare_shadows.insert(s);
                        }
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(&self.fast, id) {
                            drop(st);
                            self.deregister_all(&[mr]);
                        }
                        None
                    }
                }
            }
        }
    }
}
