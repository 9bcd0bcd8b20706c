import { IsNumber, IsString, Length, Matches, Max, Min } from 'class-validator';

const IDENTIFIER = /^[A-Za-z0-9_.:-]+$/;

/** Body of `POST /invoices`. */
export class CreateInvoiceDto {
  @IsString()
  @Length(1, 64)
  @Matches(IDENTIFIER, { message: 'terminalId may only contain letters, digits and _ . : -' })
  terminalId!: string;

  /** The invoice number, unique per terminal. */
  @IsString()
  @Length(1, 64)
  @Matches(IDENTIFIER, { message: 'number may only contain letters, digits and _ . : -' })
  number!: string;

  /** Greater than 0, at most 2 decimals, at most 1e9. */
  @IsNumber({ allowNaN: false, allowInfinity: false, maxDecimalPlaces: 2 })
  @Min(0.01)
  @Max(1e9)
  amount!: number;
}
