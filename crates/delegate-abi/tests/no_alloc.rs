//! The execute path allocates nothing: host `ArgList` reuse, the ABI call, the plugin glue and back.

use delegate_abi::host::{ArgList, Plugin};
use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{DTypeCode, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo};

#[global_allocator]
static GLOBAL: delegate_abi::testing::CountingAllocator = delegate_abi::testing::CountingAllocator;

/// Reads its first arg and writes its in-place output, like a KV update.
pub struct Touch;

impl Fixture for Touch {
    fn info() -> PluginInfo {
        testing::info("touch", "TouchBackend")
    }

    fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let ([input], [cache_out]) = args.borrow([0], [7])?;
        cache_out[0] = cache_out[0].wrapping_add(input[0]);
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Scripted<Touch>);

#[test]
fn executing_eight_args_through_the_abi_allocates_nothing() {
    let plugin = Plugin::embedded(delegate_root()).expect("embedded");
    let mut instance =
        plugin.init(&InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] }).expect("init");
    let inputs = vec![vec![1u8; 64]; 5];
    let mut caches = vec![vec![0u8; 256]; 2];
    let mut spare: ArgList<'static> = ArgList::with_capacity(8);
    for step in 0..100u32 {
        let before = delegate_abi::testing::allocations();
        let mut args = spare.recycle();
        for input in &inputs {
            args.push_input(input, DTypeCode::F32, &[16], MemoryKind::Host).expect("input");
        }
        let (first, second) = caches.split_at_mut(1);
        let a = args.push_inout(&mut first[0], DTypeCode::F32, &[64], MemoryKind::Host).expect("cache");
        args.push_inout(&mut second[0], DTypeCode::F32, &[64], MemoryKind::Host).expect("cache");
        args.push_output_in_place(a, DTypeCode::F32, &[64]).expect("alias");
        instance.execute(&mut args, None).expect("execute");
        spare = args.recycle();
        let allocated = delegate_abi::testing::allocations() - before;
        // Step 0 may build the delegate (`Delegate::new`, once per plugin).
        if step > 0 {
            assert_eq!(allocated, 0, "step {step} allocated {allocated} times");
        }
    }
    drop(spare);
    assert_eq!(caches[0][0], 100);
}
