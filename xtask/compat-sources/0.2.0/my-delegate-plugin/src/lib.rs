delegate_abi::export_delegate!(my_delegate::Doubler);
