//! Expiry commands: EXPIRE PEXPIRE EXPIREAT PEXPIREAT (NX XX GT LT), TTL PTTL EXPIRETIME
//! PEXPIRETIME, PERSIST. Changes go through `ZipCache::update`, so they are atomic per key.

use zipcache::Update;

use super::{
    Args, Command, NOT_INTEGER, READS_ONE, Result, Spec, WRITES_ONE, expiry_ms, integer,
    invalid_expire, keyed, redate,
};
use crate::resp::Reply;
use crate::resp::Resp;

pub const COMMANDS: &[Spec] = &[
    keyed("expire", -3, WRITES_ONE, |a| {
        expire(a, 1000, false, "expire")
    }),
    keyed("pexpire", -3, WRITES_ONE, |a| {
        expire(a, 1, false, "pexpire")
    }),
    keyed("expireat", -3, WRITES_ONE, |a| {
        expire(a, 1000, true, "expireat")
    }),
    keyed("pexpireat", -3, WRITES_ONE, |a| {
        expire(a, 1, true, "pexpireat")
    }),
    keyed("ttl", 2, READS_ONE, |a| ttl(a, false, false)),
    keyed("pttl", 2, READS_ONE, |a| ttl(a, true, false)),
    keyed("expiretime", 2, READS_ONE, |a| ttl(a, false, true)),
    keyed("pexpiretime", 2, READS_ONE, |a| ttl(a, true, true)),
    keyed("persist", 2, WRITES_ONE, |a| {
        Ok(ExpiryCommand::Persist { key: a.next()? }.into())
    }),
];

pub enum ExpiryCommand<'a> {
    /// The EXPIRE family, its time resolved to absolute milliseconds (maybe past).
    Expire {
        key: &'a [u8],
        at: i64,
        conditions: Conditions,
    },
    /// TTL PTTL EXPIRETIME PEXPIRETIME.
    Ttl {
        key: &'a [u8],
        millis: bool,
        absolute: bool,
    },
    Persist {
        key: &'a [u8],
    },
}

impl<'a> From<ExpiryCommand<'a>> for Command<'a> {
    fn from(command: ExpiryCommand<'a>) -> Self {
        Command::Expiry(command)
    }
}

/// EXPIRE's NX XX GT LT; a key without a TTL counts as never expiring for GT and LT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conditions {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl Conditions {
    fn allow(self, current: Option<u64>, at: i64) -> bool {
        let current = current.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        !(self.nx && current.is_some()
            || self.xx && current.is_none()
            || self.gt && current.is_none_or(|t| at <= t)
            || self.lt && current.is_some_and(|t| at >= t))
    }
}

/// Options first, then the number, as Redis (`EXPIRE k x FOO` names FOO).
fn expire<'a>(
    args: &mut Args<'a>,
    unit_ms: i64,
    absolute: bool,
    command: &str,
) -> Result<Command<'a>> {
    let key = args.next()?;
    let amount = args.next()?;
    let mut conditions = Conditions::default();
    for option in args.rest() {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => conditions.nx = true,
            b"XX" => conditions.xx = true,
            b"GT" => conditions.gt = true,
            b"LT" => conditions.lt = true,
            _ => {
                return Err(
                    format!("ERR Unsupported option {}", String::from_utf8_lossy(option)).into(),
                );
            }
        }
    }
    if conditions.nx && (conditions.xx || conditions.gt || conditions.lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if conditions.gt && conditions.lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    let amount = integer(amount).ok_or(NOT_INTEGER)?;
    let at = expiry_ms(amount, unit_ms, absolute, args.now_ms())
        .ok_or_else(|| invalid_expire(command))?;
    Ok(ExpiryCommand::Expire {
        key,
        at,
        conditions,
    }
    .into())
}

fn ttl<'a>(args: &mut Args<'a>, millis: bool, absolute: bool) -> Result<Command<'a>> {
    Ok(ExpiryCommand::Ttl {
        key: args.next()?,
        millis,
        absolute,
    }
    .into())
}

impl ExpiryCommand<'_> {
    pub fn execute(self, shared: &Resp, out: &mut Reply) -> Result<()> {
        let cache = &shared.core.keys;
        let now = cache.engine().now_ms();
        match self {
            ExpiryCommand::Expire {
                key,
                at,
                conditions,
            } => {
                // The value is not read: a medium one's blob is re-headed as it is.
                let (changed, _) = cache.update_meta(key, |current| {
                    let Some(item) = current else {
                        return (Update::Keep, false);
                    };
                    if !conditions.allow(item.expires_at_ms, at) {
                        return (Update::Keep, false);
                    }
                    match u64::try_from(at) {
                        Ok(at) if at > now => (redate(item.flags, item.access, Some(at)), true),
                        _ => (Update::Delete, true),
                    }
                })?;
                out.integer(changed as i64);
            }
            ExpiryCommand::Ttl {
                key,
                millis,
                absolute,
            } => {
                let reply = match cache.info(key)?.map(|i| i.expires_at_ms) {
                    None => -2,
                    Some(None) => -1,
                    Some(Some(at)) => {
                        let left = if absolute { at } else { at.saturating_sub(now) };
                        let left = i64::try_from(left).unwrap_or(i64::MAX);
                        if millis {
                            left
                        } else {
                            left.saturating_add(500) / 1000
                        }
                    }
                };
                out.integer(reply);
            }
            ExpiryCommand::Persist { key } => {
                let (changed, _) = cache.update_meta(key, |current| match current {
                    Some(item) if item.expires_at_ms.is_some() => {
                        (redate(item.flags, item.access, None), true)
                    }
                    _ => (Update::Keep, false),
                })?;
                out.integer(changed as i64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_follow_redis() {
        let gt = Conditions {
            gt: true,
            ..Conditions::default()
        };
        assert!(
            !gt.allow(None, 10),
            "no TTL is infinite: nothing is greater"
        );
        assert!(gt.allow(Some(5), 10));
        let lt = Conditions {
            lt: true,
            ..Conditions::default()
        };
        assert!(lt.allow(None, 10));
        assert!(!lt.allow(Some(5), 10));
        let xx_gt = Conditions {
            xx: true,
            gt: true,
            ..Conditions::default()
        };
        assert!(!xx_gt.allow(None, 10));
        assert!(xx_gt.allow(Some(5), 10));
    }
}
