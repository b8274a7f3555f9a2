//! The few fields of an X.509 certificate the server needs, read from its DER: the
//! subject's common name and organizations (a client certificate's user and groups, as the
//! kube-apiserver reads them) and the validity period (when to renew the serving
//! certificate). The certificates read here were already verified by rustls, or written by
//! the agent itself; this is a reader, not a validator.

use k8s_openapi::jiff::{Timestamp, civil, tz::TimeZone};

/// `2.5.4.3`, commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// `2.5.4.10`, organizationName.
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0] EXPLICIT`: the version of a v3 certificate.
const VERSION: u8 = 0xa0;

/// A malformed certificate.
#[derive(Debug, thiserror::Error)]
#[error("malformed X.509 certificate: {0}")]
pub struct X509Error(&'static str);

/// What the server reads from a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The subject's first common name.
    pub common_name: Option<String>,
    /// The subject's organizations, in order.
    pub organizations: Vec<String>,
    /// Start of validity.
    pub not_before: Timestamp,
    /// End of validity.
    pub not_after: Timestamp,
}

/// One DER element: its tag and content, and what follows it.
fn element(input: &[u8]) -> Result<(u8, &[u8], &[u8]), X509Error> {
    let [tag, first, rest @ ..] = input else {
        return Err(X509Error("truncated element"));
    };
    let (len, rest) = if first & 0x80 == 0 {
        (usize::from(*first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(X509Error("unsupported length"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(X509Error("element longer than its input"));
    }
    Ok((*tag, &rest[..len], &rest[len..]))
}

fn expect<'a>(
    input: &'a [u8],
    want: u8,
    what: &'static str,
) -> Result<(&'a [u8], &'a [u8]), X509Error> {
    let (tag, content, rest) = element(input)?;
    if tag == want {
        Ok((content, rest))
    } else {
        Err(X509Error(what))
    }
}

fn digits(s: &[u8]) -> Result<i32, X509Error> {
    s.iter().try_fold(0i32, |acc, b| {
        if b.is_ascii_digit() {
            Ok(acc * 10 + i32::from(b - b'0'))
        } else {
            Err(X509Error("non-digit in a time"))
        }
    })
}

/// UTCTime `YYMMDDHHMMSSZ` or GeneralizedTime `YYYYMMDDHHMMSSZ`.
fn time(tag: u8, content: &[u8]) -> Result<Timestamp, X509Error> {
    let (year, rest) = match tag {
        UTC_TIME if content.len() == 13 => {
            let yy = digits(&content[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &content[2..])
        }
        GENERALIZED_TIME if content.len() == 15 => (digits(&content[..4])?, &content[4..]),
        _ => return Err(X509Error("unsupported time format")),
    };
    if rest[10] != b'Z' {
        return Err(X509Error("time not in UTC"));
    }
    let field = |i: usize| digits(&rest[i..i + 2]).map(|v| i8::try_from(v).unwrap_or(-1));
    let year = i16::try_from(year).map_err(|_| X509Error("year out of range"))?;
    civil::DateTime::new(
        year,
        field(0)?,
        field(2)?,
        field(4)?,
        field(6)?,
        field(8)?,
        0,
    )
    .and_then(|dt| dt.to_zoned(TimeZone::UTC))
    .map(|z| z.timestamp())
    .map_err(|_| X509Error("invalid date"))
}

/// Reads the subject and validity of a DER certificate.
///
/// # Errors
/// When the DER is not a certificate this reader understands.
pub fn parse(der: &[u8]) -> Result<CertificateInfo, X509Error> {
    let (cert, _) = expect(der, SEQUENCE, "not a certificate")?;
    let (tbs, _) = expect(cert, SEQUENCE, "no TBSCertificate")?;
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == VERSION {
        rest = after;
    }
    let (_, _serial, rest) = element(rest)?;
    let (_, rest) = expect(rest, SEQUENCE, "no signature algorithm")?;
    let (_, rest) = expect(rest, SEQUENCE, "no issuer")?;
    let (validity, rest) = expect(rest, SEQUENCE, "no validity")?;
    let (subject, _) = expect(rest, SEQUENCE, "no subject")?;

    let (tag, content, more) = element(validity)?;
    let not_before = time(tag, content)?;
    let (tag, content, _) = element(more)?;
    let not_after = time(tag, content)?;

    let mut common_name = None;
    let mut organizations = Vec::new();
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (set, next) = expect(rdns, SET, "a name component is not a SET")?;
        rdns = next;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (attr, next) = expect(attrs, SEQUENCE, "an attribute is not a SEQUENCE")?;
            attrs = next;
            let (oid, value) = expect(attr, OID, "an attribute has no type")?;
            let (_, text, _) = element(value)?;
            let text = String::from_utf8_lossy(text).into_owned();
            if oid == OID_COMMON_NAME && common_name.is_none() {
                common_name = Some(text);
            } else if oid == OID_ORGANIZATION {
                organizations.push(text);
            }
        }
    }
    Ok(CertificateInfo {
        common_name,
        organizations,
        not_before,
        not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(cn: &str, orgs: &[&str]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        // rcgen keeps one value per attribute type: a second organization goes in as a
        // custom type with the same OID.
        for (i, o) in orgs.iter().enumerate() {
            let ty = if i == 0 {
                rcgen::DnType::OrganizationName
            } else {
                rcgen::DnType::CustomDnType(vec![2, 5, 4, 10])
            };
            params.distinguished_name.push(ty, *o);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.not_before = rcgen::date_time_ymd(2024, 1, 2);
        params.not_after = rcgen::date_time_ymd(2060, 3, 4);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn reads_user_groups_and_validity() {
        let der = certificate("system:node:n1", &["system:nodes", "team-a"]);
        let info = parse(&der).unwrap();
        assert_eq!(info.common_name.as_deref(), Some("system:node:n1"));
        assert_eq!(info.organizations, ["system:nodes", "team-a"]);
        assert_eq!(info.not_before.to_string(), "2024-01-02T00:00:00Z");
        // After 2049 the validity is a GeneralizedTime.
        assert_eq!(info.not_after.to_string(), "2060-03-04T00:00:00Z");
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse(b"").is_err());
        assert!(parse(&[0x30, 0x82, 0xff]).is_err());
        assert!(parse(&[0x04, 0x01, 0x00]).is_err());
    }
}
