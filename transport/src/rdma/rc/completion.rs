//! Work completions by status: what every error completion is counted as, never dropped.

use super::*;

/// A work completion's status, as rdma-core names it (`ibv_wc_status_str`'s short forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    RemAbortErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
    Other(u32),
}

impl WcStatus {
    pub fn from_raw(status: u32) -> WcStatus {
        use WorkCompletionStatus::*;
        match WorkCompletionStatus::from(status) {
            Success => WcStatus::Success,
            LocalLengthError => WcStatus::LocLenErr,
            LocalQueuePairOperationError => WcStatus::LocQpOpErr,
            LocalProtectionError => WcStatus::LocProtErr,
            WorkRequestFlushedError => WcStatus::WrFlushErr,
            BadResponseError => WcStatus::BadRespErr,
            LocalAccessError => WcStatus::LocAccessErr,
            RemoteInvalidRequestError => WcStatus::RemInvReqErr,
            RemoteAccessError => WcStatus::RemAccessErr,
            RemoteOperationError => WcStatus::RemOpErr,
            RetryCounterExceededError => WcStatus::RetryExcErr,
            ResponderNotReadyRetryCounterExceededError => WcStatus::RnrRetryExcErr,
            RemoteAbortedError => WcStatus::RemAbortErr,
            FatalError => WcStatus::FatalErr,
            ResponseTimeoutError => WcStatus::RespTimeoutErr,
            GeneralError => WcStatus::GeneralErr,
            _ => WcStatus::Other(status),
        }
    }

    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            WcStatus::Success => "SUCCESS",
            WcStatus::LocLenErr => "LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "LOC_QP_OP_ERR",
            WcStatus::LocProtErr => "LOC_PROT_ERR",
            WcStatus::WrFlushErr => "WR_FLUSH_ERR",
            WcStatus::BadRespErr => "BAD_RESP_ERR",
            WcStatus::LocAccessErr => "LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "REM_ACCESS_ERR",
            WcStatus::RemOpErr => "REM_OP_ERR",
            WcStatus::RetryExcErr => "RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "RNR_RETRY_EXC_ERR",
            WcStatus::RemAbortErr => "REM_ABORT_ERR",
            WcStatus::FatalErr => "FATAL_ERR",
            WcStatus::RespTimeoutErr => "RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "GENERAL_ERR",
            WcStatus::Other(n) => return write!(f, "status {n}"),
        };
        f.write_str(name)
    }
}

/// Completion outcomes by status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompletionCounts(pub BTreeMap<WcStatus, u64>);

impl CompletionCounts {
    pub fn get(&self, status: WcStatus) -> u64 {
        self.0.get(&status).copied().unwrap_or(0)
    }

    pub fn errors(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| !k.is_success())
            .map(|(_, v)| v)
            .sum()
    }
}
