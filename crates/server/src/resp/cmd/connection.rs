//! Connection commands: PING ECHO QUIT SELECT CLIENT (ID GETNAME SETNAME SETINFO) HELLO
//! AUTH. Only these see the client's own state (and CLUSTER, the address it reached).

use super::server::REDIS_VERSION;
use super::{
    Command, ErrorReply, Flow, NOT_INTEGER, Result, SYNTAX, Spec, integer, spec, with_subcommands,
};
use crate::core::access::DEFAULT_USER;
use crate::resp::Resp;
use crate::resp::{Client, Reply};

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

pub const COMMANDS: &[Spec] = &[
    spec("ping", -1, |a| {
        let message = if a.remaining() > 0 {
            Some(a.next()?)
        } else {
            None
        };
        if a.remaining() > 0 {
            return Err(a.wrong_number());
        }
        Ok(ConnectionCommand::Ping { message }.into())
    }),
    spec("echo", 2, |a| {
        Ok(ConnectionCommand::Echo { message: a.next()? }.into())
    }),
    // QUIT ignores arguments, as Redis does.
    spec("quit", -1, |a| {
        a.rest();
        Ok(ConnectionCommand::Quit.into())
    }),
    spec("select", 2, |a| match integer(a.next()?) {
        Some(db) => Ok(ConnectionCommand::Select { db }.into()),
        None => Err(NOT_INTEGER.into()),
    }),
    with_subcommands("client", -2, CLIENT_SUBCOMMANDS, |a| {
        a.subcommand(CLIENT_SUBCOMMANDS)
    }),
    spec("hello", -1, hello),
    spec("auth", -2, |a| {
        let (user, password) = match a.rest() {
            [password] => (None, *password),
            [user, password] => (Some(*user), *password),
            _ => return Err(SYNTAX.into()),
        };
        Ok(ConnectionCommand::Auth { user, password }.into())
    }),
];

const CLIENT_SUBCOMMANDS: &[Spec] = &[
    spec("id", 2, |_| Ok(ConnectionCommand::ClientId.into())),
    spec(
        "getname",
        2,
        |_| Ok(ConnectionCommand::ClientGetName.into()),
    ),
    spec("setname", 3, |a| {
        Ok(ConnectionCommand::ClientSetName {
            name: client_name(a.next()?)?,
        }
        .into())
    }),
    // Client libraries announce themselves (redis-py does on connecting); nothing to keep.
    spec("setinfo", 4, |a| {
        let attribute = a.next()?;
        if !attribute.eq_ignore_ascii_case(b"LIB-NAME")
            && !attribute.eq_ignore_ascii_case(b"LIB-VER")
        {
            return Err(format!(
                "ERR Unrecognized option '{}'",
                String::from_utf8_lossy(attribute)
            )
            .into());
        }
        a.next()?;
        Ok(ConnectionCommand::ClientSetInfo.into())
    }),
];

pub enum ConnectionCommand<'a> {
    Ping {
        message: Option<&'a [u8]>,
    },
    Echo {
        message: &'a [u8],
    },
    Quit,
    /// Only database 0 exists.
    Select {
        db: i64,
    },
    ClientId,
    ClientGetName,
    /// An empty name clears it.
    ClientSetName {
        name: &'a [u8],
    },
    ClientSetInfo,
    Hello {
        /// `None` keeps the current protocol.
        resp3: Option<bool>,
        auth: Option<(&'a [u8], &'a [u8])>,
        name: Option<&'a [u8]>,
    },
    Auth {
        /// `None`: the one-argument form, for the default user.
        user: Option<&'a [u8]>,
        password: &'a [u8],
    },
}

impl<'a> From<ConnectionCommand<'a>> for Command<'a> {
    fn from(command: ConnectionCommand<'a>) -> Self {
        Command::Connection(command)
    }
}

/// Redis's rule for client names: printable ASCII without spaces.
fn client_name(name: &[u8]) -> Result<&[u8]> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(
            "ERR Client names cannot contain spaces, newlines or special characters.".into(),
        );
    }
    Ok(name)
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
fn hello<'a>(args: &mut super::Args<'a>) -> Result<Command<'a>> {
    let resp3 = if args.remaining() > 0 {
        match integer(args.next()?) {
            Some(version @ (2 | 3)) => Some(version == 3),
            Some(_) => return Err("NOPROTO unsupported protocol version".into()),
            None => return Err("ERR Protocol version is not an integer or out of range".into()),
        }
    } else {
        None
    };
    let (mut auth, mut name) = (None, None);
    while args.remaining() > 0 {
        let option = args.next()?;
        if option.eq_ignore_ascii_case(b"AUTH") && args.remaining() >= 2 {
            auth = Some((args.next()?, args.next()?));
        } else if option.eq_ignore_ascii_case(b"SETNAME") && args.remaining() >= 1 {
            name = Some(client_name(args.next()?)?);
        } else {
            return Err(format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(option)
            )
            .into());
        }
    }
    Ok(ConnectionCommand::Hello { resp3, auth, name }.into())
}

impl ConnectionCommand<'_> {
    pub fn execute(self, shared: &Resp, client: &mut Client, out: &mut Reply) -> Result<Flow> {
        match self {
            ConnectionCommand::Ping { message: None } => out.simple("PONG"),
            ConnectionCommand::Ping {
                message: Some(message),
            }
            | ConnectionCommand::Echo { message } => out.bulk(message),
            ConnectionCommand::Quit => {
                out.simple("OK");
                return Ok(Flow::Close);
            }
            ConnectionCommand::Select { db: 0 } | ConnectionCommand::ClientSetInfo => {
                out.simple("OK")
            }
            ConnectionCommand::Select { .. } if shared.core.cluster.enabled() => {
                return Err("ERR SELECT is not allowed in cluster mode".into());
            }
            ConnectionCommand::Select { .. } => return Err("ERR DB index is out of range".into()),
            ConnectionCommand::ClientId => out.integer(client.id as i64),
            ConnectionCommand::ClientGetName => out.maybe_bulk(client.name.as_deref()),
            ConnectionCommand::ClientSetName { name } => {
                client.name = (!name.is_empty()).then(|| name.to_vec());
                out.simple("OK");
            }
            ConnectionCommand::Hello { resp3, auth, name } => {
                if let Some((user, password)) = auth {
                    let flow = log_in(shared, client, out, user, password)?;
                    if !matches!(flow, Flow::Continue) {
                        return Ok(flow);
                    }
                }
                if !client.authenticated {
                    return Err(ErrorReply::from(
                        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
                    ));
                }
                if let Some(name) = name {
                    client.name = (!name.is_empty()).then(|| name.to_vec());
                }
                client.resp3 = resp3.unwrap_or(client.resp3);
                // The reply already speaks the protocol version just chosen.
                out.resp3 = client.resp3;
                hello_reply(client, shared.core.cluster.enabled(), out);
            }
            ConnectionCommand::Auth { user, password } => {
                if user.is_none() && !shared.core.access.required() {
                    return Err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into());
                }
                let flow = log_in(shared, client, out, user.unwrap_or(DEFAULT_USER), password)?;
                if matches!(flow, Flow::Continue) {
                    out.simple("OK");
                }
                return Ok(flow);
            }
        }
        Ok(Flow::Continue)
    }
}

/// AUTH and HELLO's AUTH: `Continue` once `user` logged in with `password`. A refusal
/// is `WRONGPASS`, counted against the connection (its reply delayed: `Logins`); the last
/// one allowed is written here and closes the connection.
fn log_in(
    shared: &Resp,
    client: &mut Client,
    out: &mut Reply,
    user: &[u8],
    password: &[u8],
) -> Result<Flow> {
    let granted = shared.core.access.admits(user, password);
    let closing = client.logins.attempted(granted, &shared.core.counters);
    if granted {
        client.authenticated = true;
        Ok(Flow::Continue)
    } else if closing {
        out.error(WRONGPASS);
        Ok(Flow::Close)
    } else {
        Err(WRONGPASS.into())
    }
}

fn hello_reply(client: &Client, cluster: bool, out: &mut Reply) {
    out.map(7);
    for (key, value) in [("server", "redis"), ("version", REDIS_VERSION)] {
        out.bulk(key.as_bytes());
        out.bulk(value.as_bytes());
    }
    out.bulk(b"proto");
    out.integer(if client.resp3 { 3 } else { 2 });
    out.bulk(b"id");
    out.integer(client.id as i64);
    let mode = if cluster { "cluster" } else { "standalone" };
    for (key, value) in [("mode", mode), ("role", "master")] {
        out.bulk(key.as_bytes());
        out.bulk(value.as_bytes());
    }
    out.bulk(b"modules");
    out.array(0);
}
